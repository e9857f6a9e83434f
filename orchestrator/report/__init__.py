"""Tables, plots and the HTML report of an experiment; exports of its records.

``write_report(store, experiment, out_dir)`` is the one call that makes the page: it writes
``index.html`` with its PNG figures beside it and returns the path of ``index.html``.
"""

from orchestrator.report.writer import WrittenReport, render_report, report_document, write_report

__all__ = ["WrittenReport", "render_report", "report_document", "write_report"]
