"""Tar indexes: DALI's text index and the columnar one derived from it, checked against the tar before they are trusted."""
