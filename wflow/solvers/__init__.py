"""Solvers: particles (ODE/SDE on the sphere), continuum (Eulerian, Lagrangian), JKO."""
