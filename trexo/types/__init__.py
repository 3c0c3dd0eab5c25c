"""Plain data: attrs frozen classes that travel on the wire (see `trexo.wire`)."""
