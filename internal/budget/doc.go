// Package budget bounds the bytes a server holds at once across the
// requests it is reading and serving: each request takes what it is about
// to hold before it holds it and gives it back when it lets go, so that
// many large requests arriving together are refused rather than grow the
// process without limit.
//
// It owns only the count, and AllocSize, what a request takes for an
// allocation of a given size. Deciding what a refusal answers (HTTP 503, a
// brpc ELIMIT) is the servers'; it opens nothing and imports nothing of
// kvcar.
package budget
