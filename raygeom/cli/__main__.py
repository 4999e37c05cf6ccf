from raygeom.cli.root import main

main()
