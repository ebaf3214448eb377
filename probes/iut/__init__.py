"""Implementations under test: the adapter protocol, the reference, the
production libraries and the peer environments they run in."""
