"""Handing freed heap memory back to the system."""


def give_back_freed_memory():
    """Hand the heap's free pages back to the system (glibc's malloc_trim).
    Arrays of a few MB that glibc, having raised its mmap threshold, took
    from the heap stay resident once freed; a map that frees a rank's
    collection, or a reduce that moves every rank's columns into one table,
    would otherwise hold the freed pages beside what replaced them.  A
    no-op where there is no glibc."""
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass
