"""`python cli.py ...` from a checkout: the same CLI as the `raygeom` console script."""

from raygeom.cli.root import run_as_process

if __name__ == "__main__":
    run_as_process()
