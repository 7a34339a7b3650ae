"""The correlate stage: what ran beside and before each collective, why the
last rank was late, and how much communication was exposed."""
