"""The report stage: options that need no pandas (``options``), the
TraceLens-compatible sheets and their writers (``sheets``), and the fast cell
formatting behind the CSV and xlsx writers (``cells``)."""
