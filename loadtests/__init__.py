"""Multi-tenant load and fault tests of the Serve application (issue 18): see loadtests/README.md."""
