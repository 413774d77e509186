"""Registered experiments shipped with paxlike (`--list_experiments` shows them)."""
