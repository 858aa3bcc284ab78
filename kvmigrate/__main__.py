from kvmigrate.cli import main

# Guarded: the recorder's worker is started with `spawn`, which imports the parent's
# main module again in the child.
if __name__ == "__main__":
    main()
