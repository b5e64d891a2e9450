"""What users read: the long Parquet schema and model records, resume identity, tables and
figures."""
