"""FrugalTrainPipeline and the threads it runs beside the step."""
