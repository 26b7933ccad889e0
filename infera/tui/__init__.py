"""``kvd top``: a live dashboard of a running kvd daemon.

``model`` turns successive STATS replies into rates and history (no Textual import, so the
benchmark and tests can use it alone); ``panels`` turns one STATS reply into Rich renderables;
``app`` is the Textual application that polls the daemon off the UI thread and shows both.
"""
