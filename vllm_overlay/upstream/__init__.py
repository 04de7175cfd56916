"""The upstream: the lock, the imported release trees and their object checks, safe tar
extraction, the package indexes and their pages."""
