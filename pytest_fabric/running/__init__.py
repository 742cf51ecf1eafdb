"""running/: one pytest session's objects, wired by plugin.py: options, the session, the matrix,
the fixtures' objects."""
