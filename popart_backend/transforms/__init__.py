"""IR passes. ``pipeline.py`` lists the order in which a session runs them."""
