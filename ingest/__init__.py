"""The readers of other people's telemetry: nvidia-smi CSV (``ingest.importer``) and XML
(``ingest.smi_xml``), dcgm-exporter scrapes (``ingest.dcgm``) and Prometheus-compatible servers
(``ingest.prometheus``). They turn what they read into the store's records; the node agent never
runs them.
"""
