"""Plugins: the hook specifications, the registry of sink types and the calling of observers."""
