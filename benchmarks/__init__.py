"""pylog's benchmark harness: ``run.py`` measures the cases in ``cases/``, ``render.py`` writes the report."""
