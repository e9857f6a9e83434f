"""Backends provision an arm, give back endpoints, scrape and tear down: sim, local, kubernetes."""
