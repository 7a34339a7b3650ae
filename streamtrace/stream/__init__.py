"""The event stream: the bytes between stages (``format``) and its record
frames as DataFrames (``records``)."""
from .format import (MAGIC, MAX_RANK, Frame, Kind, RankData, StreamWriter, TableFrame, decode_strings, decode_table,
                     encode_frame, encode_table, iter_frames, json_frame, read_stream, read_tables, strings_frame,
                     table_frame, table_names)

__all__ = ["MAGIC", "MAX_RANK", "Frame", "Kind", "RankData", "StreamWriter", "TableFrame", "decode_strings",
           "decode_table", "encode_frame", "encode_table", "iter_frames", "json_frame", "read_stream", "read_tables",
           "strings_frame", "table_frame", "table_names"]
