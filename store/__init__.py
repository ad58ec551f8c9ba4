"""The contract with the store: what every other room reads and writes.

The schema's records and vocabulary enums (``store.schema``), the metric vocabularies shared by the
exporter and the readers of dcgm-exporter data (``store.vocabulary``), the store file itself
(``store.storefile``: opening, checking and migrating a DuckDB store), fleet locations
(``store.location``: directories and object stores of published segments) and the error root
(``store.errors``). It imports nothing else of ours; the agent, the readers, the analyzer and the
report all build on it.
"""
