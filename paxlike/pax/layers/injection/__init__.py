"""praxis.layers.injection: the einsum injections Pax files configure."""
