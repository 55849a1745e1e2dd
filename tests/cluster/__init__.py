"""The share-nothing test cluster: namespaced nodes on one machine sharing only the bucket, PostgreSQL, MLflow."""
