"""Graph builders: turn the aggregation model into dask task graphs."""
