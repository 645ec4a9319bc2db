"""host-local IPAM: addresses from configured ranges, one file per allocated IP under dataDir/<network>."""
