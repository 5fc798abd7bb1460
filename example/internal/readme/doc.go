// Package readme holds the tests of the documentation: every Go snippet of
// README.md, docs/guide.md and docs/integrations.md compiles, and the
// claims of docs/integrations.md hold on real redis-server nodes (the ACL
// it documents, Redis Cluster hash tags, TLS).
package readme
