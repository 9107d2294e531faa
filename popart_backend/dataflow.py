"""Placeholder: filled by the foundation issue (#2)."""

__all__: list[str] = []
