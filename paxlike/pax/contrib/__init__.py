"""paxml.contrib and praxis.contrib: what Pax's GPU configs import (`gpu.scripts_gpu`).

Both `paxml.contrib.gpu.scripts_gpu` and `praxis.contrib.gpu.scripts_gpu` port to
`paxlike.pax.contrib.gpu.scripts_gpu`, whose module names do not collide.
"""
