"""What stops bad data: the Great Expectations gate step, baselines from earlier runs, licences."""
