"""Placement on simulated devices: the engine's own scheduler stepped against a virtual clock,
each forward priced by a cost model (this box's, fitted from a measured placement run; a GPU's
roofline), so the placement question can be answered for hardware this machine is not.
Everything it produces is labelled SIMULATED with the cost model it came from."""
