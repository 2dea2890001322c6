"""The write machinery that is not a task graph: preparing a write's target (``target.py``)."""
