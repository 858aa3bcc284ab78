"""The candidates' engines and GPUs, read from their own metrics in the background: where
the report's GPU, KV and cost-per-token figures come from."""
