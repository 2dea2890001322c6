"""Fragment I/O: open one fragment file, read part of one variable, and bring
the values into the aggregation's canonical form."""
