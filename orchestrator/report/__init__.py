"""Tables, plots and the HTML report of an experiment."""
