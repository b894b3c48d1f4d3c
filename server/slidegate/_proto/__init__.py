"""Generated from protos/ by protos/generate.py: do not edit."""
