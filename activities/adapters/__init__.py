"""Provider adapters: one module per provider, each mapping its failures onto an ErrorKind."""
