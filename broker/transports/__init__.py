"""The transports: RabbitMQ (aio-pika for services, pika for the synchronous client)
and the in-process memory transport."""
