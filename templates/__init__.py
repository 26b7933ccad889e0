"""Jinja2 templates that ``kvd launch`` renders the deployment model through (package data)."""
