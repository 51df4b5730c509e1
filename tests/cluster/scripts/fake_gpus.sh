#!/bin/sh
# Spark's GPU discovery script for the emulated cluster's workers: one GPU per host that is not
# there, at address host + 4 (host 1, 198.18.0.11: "5"), so a test can tell which one a task
# was given. SPARK_LOCAL_IP is the worker's host address (ember.emulated.netns sets it).
octet=${SPARK_LOCAL_IP##*.}
echo "{\"name\": \"gpu\", \"addresses\": [\"$((octet - 6))\"]}"
