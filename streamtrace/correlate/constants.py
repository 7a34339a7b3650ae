"""The numbers spec blocking-analysis.md fixes that several analyses share."""
NS_PER_US = 1000.0                      # times are integer ns; sheets show µs
HIGH_OVERLAP, LOW_OVERLAP = 0.5, 0.05   # buckets of spec §2
MIN_SAMPLES = 3                         # fewer in a bucket: say so, no number
TOP_N = 3
