"""Results and the choice: the row store and its schema, analysis, batches, intervals, tune."""
