"""`kvmigrate plan`: replay recorded traffic through a simulated vLLM fleet to size it.

workload (records, JSONL) -> simulate (routing -> per-replica scheduler with a prefix
cache, step times from the calibrated cost model) -> metrics per fleet size -> sweep (the
smallest fleet meeting the SLO, its cost) -> text, JSON or HTML.
"""
