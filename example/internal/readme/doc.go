// Package readme holds the test that compiles every Go snippet of the
// repository's README.md, so that the README's code works as written.
package readme
