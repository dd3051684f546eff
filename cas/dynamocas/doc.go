// Package dynamocas is package cas's typed versioned Store on DynamoDB:
// read a value with its version, decide, and write only if the version is
// still the one read, each write one conditional PutItem, UpdateItem or
// DeleteItem.
//
// Use it when the data lives in DynamoDB and the new value needs
// application logic. Backend stores the records; NewStore, Store and the
// options are package cas's own (the same types), so code written against
// cas.Store works on either backend, and errors.Is(err, cas.ErrConflict)
// holds for this package's errors. A program that imports only this package
// compiles no pgx.
//
// The PostgreSQL twin is package cas (cas.PostgresBackend, and cas.Retry
// for your own tables). What this package does not promise is what cas
// does not: a function may run more than once, and a write whose response
// is lost is reported as ErrAmbiguousCommit, never retried for you.
package dynamocas
