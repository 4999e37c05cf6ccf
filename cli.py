"""`python cli.py ...` from a checkout: the same CLI as the `raygeom` console script."""

from raygeom.cli.root import main

if __name__ == "__main__":
    main()
