int placeholder_metric_unit = 0;
