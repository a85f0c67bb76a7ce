"""One transport per URL scheme, in one registry (`schemes`): local files, ranged http(s), s3, gs, `pipe:`."""
