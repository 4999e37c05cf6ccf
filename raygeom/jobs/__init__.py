"""Job drivers, the layer above the analyses: a job file or a command's grid in, extraction requests and
analysis units handed to the engine, tables, plots and reports out.

Imports point one way: cli -> jobs -> analyses -> (engine.contract, numerics, replica requests, store);
the engine runs units and replicas and imports no analysis and no job (tests/unit/test_import_graph.py).
"""
