"""The report stage: the ``align.*`` tables in, TraceLens-compatible sheets
(``{name: DataFrame}``) out, then written as a workbook or CSV files.

``sheets``     ``build_report``: the order the sheets are built in (two groups,
               the second forked on two cores) and the data_quality findings
``tables``     ``collect_tables``: the tables a report starts from (a stream
               not yet through ``align`` is aligned here)
``rows``       nccl_long and the per-row / per-instance arrays every sheet reads
``implicit``   nccl_implicit_sync, its summary and straggler_summary
``all2allv``   nccl_all2allv, its summary and the heatmap
``summaries``  nccl_summary_long, nccl_summary_by_size, clock_alignment
``nodes``      the node_id / node_span columns
``columns``    every sheet's column names, in order
``writers``    ``write_xlsx`` (its own XML engine, or openpyxl), ``write_csvs``
               / ``CsvDir``, ``write_report``: atomic, formula-safe
``cells``      columns to cell texts for the writers' C row writer
``files``      sheet names, output checks and the default workbook path (no pandas)
``options``    the aggregation options (no pandas)
"""
