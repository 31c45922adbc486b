"""The `gpushare` command line."""
