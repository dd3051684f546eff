package pgerr

// BoundFor is Bound with a deadline d ahead instead of CommitTimeout.
var BoundFor = bound
