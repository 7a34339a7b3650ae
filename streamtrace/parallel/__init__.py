"""Running work beside the main thread: background threads (``threads``),
forked children (``fork``) and the CPUs there are to use (``cpus``)."""
