from raygeom.cli.root import run_as_process

run_as_process()
