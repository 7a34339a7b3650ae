"""Bytes in and out: opening and decompressing traces (``reading``), finding
each rank's trace (``ranks``), and outputs that appear only when complete
(``outputs``)."""
