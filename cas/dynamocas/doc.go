// Package dynamocas is package cas's Backend on DynamoDB: a cas.Store's
// (key, value, version) records as items of a table, each write one
// conditional PutItem, UpdateItem or DeleteItem.
//
// Use it when the data lives in DynamoDB and the new value needs
// application logic:
//
//	b, err := dynamocas.NewBackend(client, "docs") // WithKeyAttributes for other key names
//	store, err := cas.NewStore[Doc](b, nil)
//
// Its errors are package cas's (cas.ErrConflict, cas.ErrAmbiguousCommit …).
// A program that imports only cas and this package compiles no pgx. The
// PostgreSQL twin is package pgcas. What it does not promise is what cas
// does not: a function may run more than once, and a write whose response
// is lost is reported as cas.ErrAmbiguousCommit, never retried for you.
package dynamocas
