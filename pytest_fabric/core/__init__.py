"""core/: what every role shares, importing nothing above it: the fabric and model catalogs, the
case, units, files written whole, secrets masked, disk faults."""
